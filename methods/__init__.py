"""Published methods beyond the three papers the library reproduces, one module each, registered
on import (:mod:`dlm.registry`): every module of this package is imported here, so adding a
method is adding its module.
"""

from importlib import import_module
from pkgutil import iter_modules

for _module in iter_modules(__path__):
    import_module(f"{__name__}.{_module.name}")
