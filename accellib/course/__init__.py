"""What only the notebooks use: the "your turn" checker."""
