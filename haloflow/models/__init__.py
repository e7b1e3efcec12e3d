"""haloflow.models"""
