"""The ops the models call, each with one dispatch point: kernel or XLA."""
