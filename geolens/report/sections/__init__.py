"""One module per report section, each with ``build(ctx: ReportContext) -> Section``."""
