"""What a run says to people: the console (`console.py`) and the HTML run report (`html.py`)."""
