"""The studies behind docs/results.md: DeepSeekMath's and Math-Shepherd's comparisons (`python -m experiments`), the
credit study, the PRM study and the noise and alignment checks. Run each as a module from the repository root
(`python -m experiments.<name> --help`); the index: bench/README.md."""

import bench  # noqa: F401  (first, as for the benchmarks: warnings and tqdm quiet)
