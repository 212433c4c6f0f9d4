"""Run folders on disk: result.json, CSVs, plots and report.html for runs, sweeps and capacity searches."""
