"""Fashion-MNIST on Flower with fedsel's client selection."""
