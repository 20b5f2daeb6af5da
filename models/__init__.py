"""Model factory: `create_model(model_cfg, num_classes)`."""

from models.factory import MODELS, create_model, describe_model

__all__ = ["MODELS", "create_model", "describe_model"]
