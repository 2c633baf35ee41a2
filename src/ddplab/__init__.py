"""ddplab: train image classifiers on one device or many, with numbers you can trust."""
__version__ = "0.1.0"
