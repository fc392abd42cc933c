"""How any role serves or reaches the policy: the generators' HTTP service
(service.py) and the request intake it shares with the OpenAI endpoint
(intake.py), the announcement a serving process writes into the run
directory (announcements.py), the client that reads them and balances
requests (client.py), and a service started inside the caller (inprocess.py)."""
