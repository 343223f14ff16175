"""The CLI verbs, one module each (add_arguments, run); heavy imports stay inside run()."""
