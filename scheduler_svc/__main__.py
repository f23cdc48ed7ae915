try:
    from scheduler_svc.api.server import main
except KeyboardInterrupt:  # Ctrl-C while still importing: stop quietly, as main() would
    raise SystemExit(0) from None

main()
