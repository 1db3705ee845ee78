"""Suite-wide test settings.

Hypothesis runs derandomized: the property tests explore the same examples on every run, so a
CI result does not depend on the draw (set EMBER_HYPOTHESIS_RANDOM=1 to explore new examples).
"""

import os

from hypothesis import settings

settings.register_profile("ember", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("explore" if os.environ.get("EMBER_HYPOTHESIS_RANDOM") else "ember")
