"""The report of evaluation tables: its tables and headline numbers (:mod:`mage.report.tables`),
its Markdown (:mod:`mage.report.markdown`), its plots (:mod:`mage.report.plots`) and the
intervals behind every figure (:mod:`mage.report.intervals`)."""
