try:
    from executor_svc.service.server import main
except KeyboardInterrupt:  # Ctrl-C while still importing (torch takes a while): stop quietly
    raise SystemExit(0) from None

main()
