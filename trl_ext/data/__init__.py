"""What the library reads and feeds to models: .jsonl files (``jsonl``), prompt files in TRL's formats
(``prompt_files``), prompt datasets tokenized for the trainer (``prompt_dataset``), padding (``batching``)."""
