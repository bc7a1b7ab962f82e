"""txf.data: tokenizers, the built-in corpus, TFDS, text files, generated tasks, batching.

Numpy only (no jax): batches are dicts of numpy arrays holding this
process's rows of a global batch. Entry points:

  spec = parse_data(config.data)     # the `data` section, checked (a DataSpec)
  ds = make_dataset(spec, 'train', seed=0, process_index=p,
                    process_count=P, workdir=workdir)
  batch = next(ds); state = ds.get_state(); ds.set_state(state)
  tokenizer = make_tokenizer(spec, workdir)

Batch formats by data.task (B = data.batch_size / process_count,
T = data.seq_len; padding holds the tokenizer's pad_id, 0 for txf's own):
  lm        inputs int32 [B, T], targets int32 [B, T] (inputs shifted by one),
            weights float32 [B, T]
  mlm       inputs int32 [B, T] (BERT-masked), targets int32 [B, T] (original),
            weights float32 [B, T] (1 at masked positions only)
            TFDS lm/mlm add segment_ids int32 [B, T] (1, 2, ... per document
            packed into the row, 0 on padding) and positions int32 [B, T]
            (from 0 in each document), unless attend_across_documents
  seq2seq   encoder_inputs int32 [B, T], decoder_inputs int32 [B, T]
            (BOS + target), targets int32 [B, T] (target + EOS),
            weights float32 [B, T]
  classify  inputs int32 [B, T] (BOS + expression), labels int32 [B]

Fields of the `data` config section (txf.data.spec.DataSpec declares each
with its default; a dataset reads those below and ignores the others):

  field              type   used by        meaning
  -----------------  -----  -------------  ------------------------------------
  name               str    all            'pystdlib' (built-in corpus: Python
                                           stdlib sources), 'copy', 'reverse',
                                           'sort', 'addition', 'listops',
                                           'induction', 'mqar' (in-context
                                           lm tasks: incontext.py),
                                           'tfds:<builder>[/<config>][:<ver>]'
                                           (a TFDS dataset prepared as
                                           ArrayRecord: tfds_source.py), or
                                           'files:PATH_OR_GLOB' (UTF-8 text
                                           files: files.py)
  task               str    all            'lm' | 'mlm' (pystdlib, tfds, files),
                                           'lm' (induction, mqar),
                                           'seq2seq' (copy/reverse/sort/
                                           addition, tfds), 'classify'
                                           (listops)
  seq_len            int    all            model context T; for generated tasks
                                           the padded length (>= max_example_len + 1);
                                           tfds seq2seq cuts longer texts
  batch_size         int    all            global batch, divisible by the
                                           process count
  tokenizer          str    text (*)       'bytes' (260 ids) | 'sentencepiece'
                                           (trained on the train split) | 'hf'
                                           (a pretrained tokenizer.json)
  sp_vocab_size      int    sentencepiece  largest vocabulary (> 262)
  tokenizer_path     str    hf             a tokenizer.json, or the model
                                           directory holding it
  max_corpus_bytes   int    pystdlib,files bytes of text read per split (lm,
                                           mlm) and for sentencepiece training
  mlm_probability    float  mlm            share of tokens selected, in (0, 1)
  min_example_len,   int    generated      source length (seq2seq),
  max_example_len                          expression tokens (listops) or
                                           block length (induction)
  num_symbols        int    induction,mqar content ids (after pad, bos, eos)
  num_kv_pairs       int    mqar           key-value pairs per row, each
                                           queried once
  listops_max_depth  int    listops        most nested operators (root = 1)
  tfds_data_dir      str    tfds           folder holding the prepared dataset;
                                           None: TFDS's default
                                           ($TFDS_DATA_DIR, ~/tensorflow_datasets)
  tfds_eval_split    str    tfds           the split evaluations read ('test'
                                           for lm1b, a slice 'validation[:9]');
                                           None: 'validation'
  tfds_text_key      str    tfds lm/mlm    text feature; None: 'text'
  tfds_source_key,   str    tfds seq2seq   source and target text features;
  tfds_target_key                          None: from a config named
                                           '<source>-<target>' ('de-en' of
                                           wmt14_translate/de-en: 'de', 'en')
  read_threads       int    tfds lm/mlm    threads reading records ahead
                                           (0: none)
  read_workers       int    tfds lm/mlm    processes reading and tokenizing
                                           the training split (0: none, this
                                           process does); None: 0
  attend_across_     bool   tfds lm/mlm    False: a token attends only to its
  documents                                own document in a packed window;
                                           True: to the whole window (GPT-2)

  (*) text: pystdlib, tfds and files.
"""

from txf.data.corpus import corpus_description, corpus_files, load_corpus
from txf.data.dataset import Dataset
from txf.data.packed import PackedDataset, ProcessCountError
from txf.data.pipeline import make_dataset, make_tokenizer
from txf.data.spec import DataSpec, num_classes, parse_data
from txf.data.tokenizers import (
  ByteTokenizer,
  HFTokenizer,
  SentencePieceTokenizer,
  SymbolTokenizer,
  Tokenizer,
)

__all__ = [
  "ByteTokenizer",
  "DataSpec",
  "Dataset",
  "HFTokenizer",
  "PackedDataset",
  "ProcessCountError",
  "SentencePieceTokenizer",
  "SymbolTokenizer",
  "Tokenizer",
  "corpus_description",
  "corpus_files",
  "load_corpus",
  "make_dataset",
  "make_tokenizer",
  "num_classes",
  "parse_data",
]
