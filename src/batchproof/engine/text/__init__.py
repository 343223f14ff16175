"""The engine's text: the tokenizer every format gives, chat templates (the model's, a built-in
one or a file), and the stream that turns generated tokens into released text."""
