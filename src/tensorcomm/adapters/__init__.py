"""The only place that knows array types: turns inputs into numpy views and results back."""
