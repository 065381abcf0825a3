raise RuntimeError("this kernel file fails when imported")
