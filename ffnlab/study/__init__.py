"""The study: plan and run many runs, store them, compare them with statistics, report and advise."""
