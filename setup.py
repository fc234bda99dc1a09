"""Installs ``dslaunch_as_deepspeed.pth`` beside the package (everything else is pyproject.toml).

The .pth line runs at every interpreter start and does nothing unless DSLAUNCH_AS_DEEPSPEED is
set; then it makes ``import deepspeed`` mean dslaunch (dslaunch/as_deepspeed.py), which is how
torchrun and ``accelerate launch`` users get the switch. A .pth must sit in site-packages itself,
which pyproject metadata cannot say, hence this build step; it covers wheels and editable
installs (``pip install -e .``, what ``make install`` runs) alike.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "dslaunch_as_deepspeed.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        # A wheel installs build_lib's top level into site-packages. An editable build keeps the
        # packages in the project, and what goes into site-packages is the install_lib directory.
        where = (self.get_finalized_command("install").install_lib if self.editable_mode
                 else self.build_lib)
        os.makedirs(where, exist_ok=True)
        shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH),
                        os.path.join(where, PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
