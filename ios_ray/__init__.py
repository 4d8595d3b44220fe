"""ios-ray: the IOS inter-operator scheduler, measured through Ray."""
