"""ImageNet-1k's sizes, for predictions made without the dataset at hand (the time model, `train.py --plan`)."""

IMAGENET_TRAIN_IMAGES = 1_281_167
VAL_IMAGES = 50_000 - 1_762  # the validation set without the devkit's blacklist (usedBlacklist: true)
