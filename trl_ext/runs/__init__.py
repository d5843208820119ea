"""One training run as the commands run it: runners, the sequence and its folder, the recorder, the machine."""
