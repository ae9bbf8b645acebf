"""`cifar-ray export`: a run folder written into the viewers people already use (viewers.py). Its own package, beside
`report`: it imports torch's TensorBoard writer and MLflow, which the report does not, when it writes."""
