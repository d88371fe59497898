"""Speed and cost benchmarks, and the fault and UI checks. Run each as a module from the repository root
(`python -m bench.<name> --help`); the index: bench/README.md."""

import os
import warnings

# `python -m bench.<name>` runs this before the script's imports: tqdm reads its settings when it is imported.
warnings.filterwarnings("ignore")
os.environ.setdefault("TQDM_DISABLE", "1")
