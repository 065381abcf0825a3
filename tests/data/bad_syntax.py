PROBLEM = {"M": None
def kernel(:
