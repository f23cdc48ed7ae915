from executor_svc.server import main

main()
