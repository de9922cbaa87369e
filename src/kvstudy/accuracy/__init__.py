"""The accuracy experiment: GSM8K through lm-eval on served configurations, and the statistics of paired answers."""
