import os
import sys

# The tests import their rank functions from this folder in spawned children.
sys.path.insert(0, os.path.dirname(__file__))
