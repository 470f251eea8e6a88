"""What runs mean, without processes: options and models, a run's report, its components
measured and predicted, comparisons, sweeps on paper, export and import."""
