"""The tiny model zoo: corpus, tokenizer, training recipe and evaluation of the shipped checkpoints."""
