"""Fashion-MNIST with a PyTorch CNN on Flower, with fedsel's client selection."""
