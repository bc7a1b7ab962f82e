"""The compute of a run: its setup (run_setup: data, model, mesh, steps), the
train and eval steps (step), seed replicas (replicas), sharding, the loop
(loop) and pretrained starts (pretrained). Its configuration is
txf.runconfig; what it writes to its work directory, txf.rundir; what is
done with a trained run afterwards, txf.trained."""
