"""Experiment tracking: Tune's TensorBoard, MLflow and W&B loggers, fed rayrl's metrics and spec."""
