"""Command line tools of uccl-ep (`uccl-ep bench | doctor | launch`)."""
