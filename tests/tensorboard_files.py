"""Readers of the TensorBoard event files a run writes, for the tests: every
Event, the scalars, and the hyperparameters the HParams dashboard gets."""

import glob
import os
import struct

from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c


def read_tensorboard_events(logdir):
  """Every Event of every event file under `logdir`, in file order.

  A minimal TFRecord reader (the `tensorboard` package is not installed):
  each record is <u64 length><u32 crc(length)><payload><u32 crc(payload)>.
  """
  events = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      header = data[pos : pos + 8]
      (length,) = struct.unpack("<Q", header)
      assert struct.unpack("<I", data[pos + 8 : pos + 12])[0] == masked_crc32c(header)
      payload = data[pos + 12 : pos + 12 + length]
      (payload_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
      assert payload_crc == masked_crc32c(payload)
      pos += 16 + length
      events.append(event_pb2.Event.FromString(payload))
  return events


def read_tensorboard_scalars(logdir):
  """{(tag, step): value} of the scalar summaries under `logdir`."""
  return {
    (value.tag, event.step): value.simple_value
    for event in read_tensorboard_events(logdir)
    for value in event.summary.value
    if value.WhichOneof("value") == "simple_value"
  }


def read_hparams(logdir):
  """(hparams {name: value}, metric tags) from the hparams plugin's summaries."""
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

  hparams, metric_tags = None, None
  for event in read_tensorboard_events(logdir):
    for value in event.summary.value:
      if value.metadata.plugin_data.plugin_name != "hparams":
        continue
      data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
      if data.HasField("session_start_info"):
        hparams = {
          name: getattr(v, v.WhichOneof("kind"))
          for name, v in data.session_start_info.hparams.items()
        }
      if data.HasField("experiment"):
        metric_tags = [info.name.tag for info in data.experiment.metric_infos]
  return hparams, metric_tags
