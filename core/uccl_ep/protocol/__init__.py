"""What every executor agrees on, in one place: the proxy protocol's counter indices and region
layout (`layout`), ring geometry (`rings`), row packing of messages (`packing`) and the plan a
low-latency dispatch hands its combine (`ll_plan`). The executors (`cuda`, `host`, `refs`) import
these modules; none of them imports another executor for a shared definition.
"""
