import os
import sys

# Tests import the packages from this checkout even before `pip install -e .`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
