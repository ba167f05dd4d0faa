"""What an agent brings in: test questions in its files, a public checkpoint, a test set learned by heart."""
