"""Reports: the suite summary now; the signed report later."""
