"""A stand-in for torchvision (tests only): ``torchvision.models`` with the model registry API ios-ray uses."""

from torchvision import models

__version__ = "0.0+fake"
__all__ = ["models"]
