"""The docs ship inside the package, so the report can carry each finding kind's page offline."""
