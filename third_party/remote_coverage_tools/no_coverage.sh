#!/bin/sh
echo "bazel coverage needs Bazel's coverage tools, which are not fetched offline." >&2
exit 1
