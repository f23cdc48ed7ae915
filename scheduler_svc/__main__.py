from scheduler_svc.server import main

main()
