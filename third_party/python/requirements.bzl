"""`requirement(name)`: a Python package the interpreter's environment holds.

The stand-in for rules_python's `pip_parse`, which needs the network: each
package is an empty target in //third_party/python, provided by the
environment `make setup` installs (requirements.txt, then TFF with
--no-deps).
"""

def requirement(name):
    return "//third_party/python:" + name
