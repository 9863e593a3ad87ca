"""Build step of the wheel: the card sources in ``models/`` ship as ``pp_opt/card_files/*.toml``.

Everything else is in ``pyproject.toml``. A checkout, or an editable install, reads
``models/`` directly (:mod:`pp_opt.card_files`); a built wheel has the cards in the package.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

MODELS = Path(__file__).resolve().parent / "models"


class BuildPyWithCards(build_py):
    """``build_py`` that also copies ``models/*.toml`` and its README into
    ``pp_opt/card_files``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "pp_opt" / "card_files"
        self.mkpath(str(target))
        for source in [*sorted(MODELS.glob("*.toml")), MODELS / "README.md"]:
            self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildPyWithCards})
