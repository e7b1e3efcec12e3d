"""haloflow.cache"""
