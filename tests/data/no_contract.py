"""Has a PROBLEM but not the rest of the contract."""
PROBLEM = {"M": None}
