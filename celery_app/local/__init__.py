"""The one-command local run (`checkbeat up`) and its live view (`checkbeat status`)."""
