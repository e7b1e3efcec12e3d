"""haloflow.engine"""
