"""The HUD: the live latency side panel (``Hud``) and its parts, fed by ``llmchat.core.observe._window.Metrics``."""

from llmchat.tui.widgets.hud._attribution import AttributionPanel
from llmchat.tui.widgets.hud._charts import ColumnChart, HudCharts
from llmchat.tui.widgets.hud._connection import ConnectionPanel, Endpoint
from llmchat.tui.widgets.hud._detail import HudDetail, PlotChart
from llmchat.tui.widgets.hud._hud import Hud
from llmchat.tui.widgets.hud._lag import RenderLagLine
from llmchat.tui.widgets.hud._pending import PendingPanel
from llmchat.tui.widgets.hud._server import ServerLine
from llmchat.tui.widgets.hud._stats import HudStats
from llmchat.tui.widgets.hud._waterfall import Waterfall

__all__ = [
    "AttributionPanel",
    "ColumnChart",
    "ConnectionPanel",
    "Endpoint",
    "Hud",
    "HudCharts",
    "HudDetail",
    "HudStats",
    "PendingPanel",
    "PlotChart",
    "RenderLagLine",
    "ServerLine",
    "Waterfall",
]
