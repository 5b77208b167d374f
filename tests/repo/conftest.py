"""The repository room: what holds the repository together rather than one product part: the docs' links and
commands, packaging and images, the node's pure parts (hack/), the checks of `make lint`, and the order of the
test run itself. No fixture of its own."""
