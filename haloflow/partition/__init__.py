"""haloflow.partition"""
