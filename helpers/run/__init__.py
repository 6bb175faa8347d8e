"""One training process: data, model, step Cells, the train loop, its measurements, monitors and profiler window."""
