"""cifar-ray: a Ray-based sweep orchestrator for data-parallel CNN training on CIFAR-10."""
