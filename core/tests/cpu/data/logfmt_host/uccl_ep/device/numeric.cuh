// Host stand-in for the vendor layer (test_logfmt.py compiles device/logfmt.cuh for the CPU): the
// harness logfmt_host.cc defines what logfmt.cuh uses before it includes it.
#pragma once
