from scheduler_svc.api.server import main

main()
